"""scopekb core library: settings, logging, models, git reading, chunking, stores and queue names.

This package imports neither the services nor the workers (checked by import-linter).
"""

__version__ = "0.1.0"
