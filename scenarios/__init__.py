"""Named racsim scenarios (shipped as racsim.scenarios.scenario)."""
