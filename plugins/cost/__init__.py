"""Cost models: what a round's invocations, learner time and transport cost in dollars, so the
budget and the scalers speak in money (AWS list prices, or the paper prototype's model)."""
