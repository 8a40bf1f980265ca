"""torch.export `.pt2` (the engine's "dynamo" format): its weights and its safe loading."""
