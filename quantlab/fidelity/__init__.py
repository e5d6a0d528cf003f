"""How far a variant's next-token distributions are from a reference's: the tensor-level statistics that the
divergence evaluation reports and that a mixed format's sensitivity scan ranks by. Depends on torch alone, so
every package that judges fidelity (quant's scans, eval, measurements) can use it."""
