"""flashfeed.plan.plan."""
