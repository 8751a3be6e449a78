"""The actors: scheduler, store, and the response builder they share."""
