# The action guard's tables arrive with the Layer 2 issue.
