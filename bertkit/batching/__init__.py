"""Training batches as one part: the plan that owns every batch rule (`plan.BatchPlan`), the
strategies it picks (`steps`), and sequence packing (`packing`)."""
