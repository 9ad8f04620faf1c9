"""The paper's claims answered from a dataset: which records answer each (claim_sources),
the answers, the verdicts, and the counterpart columns beside them."""
