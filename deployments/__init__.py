"""The Ray Serve deployments of the graph (ingress, target, draft, constraint, metrics) and what they share."""
