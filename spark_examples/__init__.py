"""The Spark pipeline over Kiln's hardened topics (docs/spark.md).

`hardened_stream` (Structured Streaming into Parquet) and `audit` (gaps and duplicates per
partition) are the jobs; `pipeline` holds the transformations they share, `session` chooses
between Spark's Kafka source and Kiln's compatible reader (`kafka_source`).
"""
