"""The custom resources Envelope judges or reads: KAI, agent-substrate, Karpenter."""
