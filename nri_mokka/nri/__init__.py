"""NRI transport (mux, ttrpc) and the plugin stub; generated protobuf bindings in _pb/ (see gen.py)."""
