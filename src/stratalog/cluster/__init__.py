"""Several brokers over shared object storage and PostgreSQL: leases, who holds which partition and
group, and the fences that keep a broker that lost one from committing for it (leases.py); the plan of
who should hold what (assignment.py)."""
