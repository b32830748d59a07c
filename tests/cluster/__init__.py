"""The cluster fault test's parts: the agent the app hosts run, the load generator, the
hosts (scripts/cluster.sh) and what is read back from the cluster's database."""
