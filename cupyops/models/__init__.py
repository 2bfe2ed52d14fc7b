"""Small model runners on cupyops operators (``cupyops.models.llama``)."""
