"""What Kubernetes does, ported from upstream and cited: no rules, no I/O."""
