"""A fleet of replicas: the ``replicas`` scenario's plan, jobs, targets and report,
and what each replica's ``/metrics`` says it did."""
