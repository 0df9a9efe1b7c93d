"""Side effects of the Run workflow, one module per thing touched: claims, sandboxes, agents, outputs."""
