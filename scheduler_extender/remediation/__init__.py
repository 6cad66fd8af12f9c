"""Acting on the cluster: thermal migration, run by the elected leader."""
