"""The coordinator: federated evaluation of signed bundles over Flower (ServerApp, ClientApp, rounds, store)."""
