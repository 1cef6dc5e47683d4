"""What every protocol is and answers: the interface (``base.py``), its spec (``spec.py``), a client's view
during one message (``session.py``) and the server state a protocol declares (``state.py``)."""
