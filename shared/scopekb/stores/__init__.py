"""Stores: the chunk index (OpenSearch; SQLite in embedded mode) and small system records."""
