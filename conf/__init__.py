"""racsim Hydra config groups (shipped as racsim.conf)."""
