/* heatmap_png.h: the heat map image of `minference eval --png`. */
#ifndef MI_TOOLS_HEATMAP_PNG_H
#define MI_TOOLS_HEATMAP_PNG_H

#include <stdbool.h>

/* Whether this build writes PNG files (it needs libpng at build time). */
bool heatmap_png_supported(void);

/* grid[m][li][di] in [0, 1] (NaN: no data, grey): one panel per method, left to right; in a panel
 * columns are lengths and rows depths (depths NULL: one unlabelled row). false when the file
 * cannot be written. */
bool heatmap_write_png(const char *path, const double *grid, int nm, int nl, int nd,
                       const long long *lengths, const long long *depths);

#endif /* MI_TOOLS_HEATMAP_PNG_H */
