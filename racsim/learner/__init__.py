"""What is the update, and how biased is it? Pure functions over arrays: the tabular MDP
(``mdp``), rollouts and their score gradients (``rollouts``), the correctors
(paper eq. 1), the theory (Theorem 2.1, Proposition 2.2), the Monte-Carlo and
exact bias (``bias``) and the training loop (``training``).
"""
