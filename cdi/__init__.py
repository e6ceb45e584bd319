"""CDI spec model, generator and validation (see the mock-node issue)."""
