"""HTTP routes of the control plane; thin wrappers over ``SandboxService``."""
