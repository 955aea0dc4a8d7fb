"""What the Helm chart and GitOps tools are given, derived from the rules."""
