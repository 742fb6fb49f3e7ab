"""The Spark pipeline over Kiln's hardened topics (docs/spark.md).

`hardened_stream` (Structured Streaming into Parquet) and `audit` (gaps and duplicates per
partition) are the jobs; both read Kafka with Spark's own Kafka source (the spark-sql-kafka
connector, which `session` puts on the classpath). `pipeline` holds the transformations they
share, `audit_report` the arithmetic that needs no Spark; the lineage rule itself is Kiln's
(`wire/lineage.py`), used by the jobs, Kiln and the tests alike.
"""
