"""The GPU model, the bottom layer: profiles, the compiled state and its writer, the edits
model and the node layout. It imports nothing else of Mokka's; everything else builds on it."""
