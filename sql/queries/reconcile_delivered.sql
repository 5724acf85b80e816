-- How many tuples have their last operation in a delivered row: those that are compared.
SELECT count(*) FROM reconcile_expected WHERE state = 'delivered'
