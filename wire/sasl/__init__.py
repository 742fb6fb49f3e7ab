"""SASL mechanisms as I/O-free server state machines: PLAIN, SCRAM-SHA-256/512, OAUTHBEARER.

`exchange` is the entry point (`new_mechanism`, `Mechanism`, `Step`); `steps` holds what a
step ends in; one module per mechanism parses its messages exactly as Kafka's `SaslServer`
implementations do (the module docstrings name the sources and every deliberate difference).
"""
