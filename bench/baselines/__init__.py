"""Same-run baselines: the floors and the alternatives each sandlot figure is compared with."""
