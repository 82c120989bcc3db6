"""What calls cost: the prices of models' tokens, and the spending limits
(``max_cost``) that hold back work once they are spent."""
