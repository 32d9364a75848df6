"""scopekb workers: Celery tasks that call the plain sync functions of :mod:`scopekb.indexing`."""
