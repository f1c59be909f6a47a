"""精度对齐 (precision-alignment): sources of numerical difference, three gates, techniques."""
