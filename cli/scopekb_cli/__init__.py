"""scopekb command line."""
