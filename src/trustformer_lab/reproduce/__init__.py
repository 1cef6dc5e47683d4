"""``trustformer reproduce``: a paper's experiment grid, cached, then its report (Trustformer's: :mod:`.grid`;
FedPC's: :mod:`.fedpc`, run by the same grid runner)."""
