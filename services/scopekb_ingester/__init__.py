"""scopekb ingester: verifies git host webhooks and enqueues syncs by task name. No git, S3 or index writes."""
