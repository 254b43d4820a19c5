"""File writing at the bottom of the house: whole files and folders under their final names or
none (`atomic`), the cache folder. `texts`, `eval` and `converters` import it; it imports none of them."""
