"""Kafka transactions (Transactions V1), coordinated by Kiln with state in Redis."""
