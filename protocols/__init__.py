"""Everything that crosses a boundary: messages, specs, failures, the Cloud and Host protocols."""
