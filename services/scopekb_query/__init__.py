"""scopekb query service: scoped search API."""
