"""What a person or a program calls: the ``racsim`` command (``cli``, one job in ``job``),
``racsim.run`` (``api``), the command's help (``guide``) and the docs' generated blocks (``docs``).
"""
