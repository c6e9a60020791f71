"""Tools beside the simulator: racsim-bench (``bench``, its speed) and racsim-profile
(``profile``, an RM's service times from real forward passes).
"""
