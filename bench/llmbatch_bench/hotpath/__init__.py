"""What llmbatch adds to each call in steady state: the hot-path scenarios (plan,
steady-state runs, references, the unmodified openai program, report) and the
instruction counter."""
