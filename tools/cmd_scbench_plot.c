/*
 * cmd_scbench_plot.c: the per-turn accuracy curves of `minference scbench --curves`: one panel
 * per mode, turns across, accuracy (0..1) up, one coloured line per method (in the table's
 * order, numbered in the legend), written as an 8-bit RGB PNG by libpng.
 */
#include "cmd_scbench.h"
#include "tool_util.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef MI_TOOLS_LIBPNG
#include <png.h>
#endif

static const unsigned char palette[10][3] = {
    {31, 119, 180}, {255, 127, 14},  {44, 160, 44},   {214, 39, 40},  {148, 103, 189},
    {140, 86, 75},  {227, 119, 194}, {127, 127, 127}, {188, 189, 34}, {23, 190, 207}};

/* 3x5 digits. */
static const char *const digits[10] = {
    "111101101101111", "010110010010111", "111001111100111", "111001111001111", "101101111001001",
    "111100111001111", "111100111101111", "111001001001001", "111101111101111", "111101111001111"};

typedef struct canvas {
    unsigned char *rgb;
    int w, h;
} canvas;

static void put(canvas *c, int x, int y, const unsigned char *col) {
    if (x < 0 || y < 0 || x >= c->w || y >= c->h) return;
    memcpy(c->rgb + ((size_t)y * c->w + x) * 3, col, 3);
}

static void dot(canvas *c, int x, int y, int r, const unsigned char *col) {
    for (int dy = -r; dy <= r; dy++)
        for (int dx = -r; dx <= r; dx++) put(c, x + dx, y + dy, col);
}

static void line(canvas *c, int x0, int y0, int x1, int y1, const unsigned char *col) {
    const int dx = abs(x1 - x0), dy = -abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    int err = dx + dy;
    for (;;) {
        dot(c, x0, y0, 1, col);
        if (x0 == x1 && y0 == y1) break;
        const int e2 = 2 * err;
        if (e2 >= dy) err += dy, x0 += sx;
        if (e2 <= dx) err += dx, y0 += sy;
    }
}

static void number(canvas *c, int x, int y, int v, int px) {
    char buf[12];
    int n = 0;
    do buf[n++] = (char)('0' + v % 10), v /= 10;
    while (v && n < 11);
    static const unsigned char black[3] = {0, 0, 0};
    for (int i = n - 1; i >= 0; i--, x += 4 * px) {
        const char *g = digits[buf[i] - '0'];
        for (int gy = 0; gy < 5; gy++)
            for (int gx = 0; gx < 3; gx++)
                if (g[gy * 3 + gx] == '1')
                    for (int dy = 0; dy < px; dy++)
                        for (int dx = 0; dx < px; dx++)
                            put(c, x + gx * px + dx, y + gy * px + dy, black);
    }
}

bool sc_write_curves_png(const char *path, const double *acc, int n_panels, int nm, int nt) {
#ifdef MI_TOOLS_LIBPNG
    if (!path || !acc || n_panels < 1 || nm < 1 || nt < 1) return false;
    const int pw = 320, ph = 220, margin = 36, gap = 24, legend = 18 * ((nm + 3) / 4) + 10;
    canvas c = {NULL, margin + n_panels * (pw + gap), margin + ph + 30 + legend};
    c.rgb = malloc((size_t)c.w * c.h * 3);
    if (!c.rgb) return false;
    memset(c.rgb, 255, (size_t)c.w * c.h * 3);
    static const unsigned char grid[3] = {220, 220, 220}, axis[3] = {0, 0, 0};
    for (int p = 0; p < n_panels; p++) {
        const int x0 = margin + p * (pw + gap), y0 = margin;
        for (int k = 0; k <= 4; k++) {
            const int y = y0 + ph - k * ph / 4;
            for (int x = x0; x <= x0 + pw; x++) put(&c, x, y, k ? grid : axis);
            if (p == 0) number(&c, 4, y - 5, k * 25, 2);
        }
        for (int y = y0; y <= y0 + ph; y++) put(&c, x0, y, axis);
        for (int t = 0; t < nt; t++) {
            const int x = nt > 1 ? x0 + 10 + t * (pw - 20) / (nt - 1) : x0 + pw / 2;
            number(&c, x - 3, y0 + ph + 8, t + 1, 2);
        }
        for (int m = 0; m < nm; m++) {
            const unsigned char *col = palette[m % 10];
            int px = -1, py = -1;
            for (int t = 0; t < nt; t++) {
                const double v = acc[((size_t)p * nm + m) * nt + t];
                if (!(v == v)) {
                    px = -1;
                    continue;
                }
                const int x = nt > 1 ? x0 + 10 + t * (pw - 20) / (nt - 1) : x0 + pw / 2;
                const int y = y0 + ph - (int)lround(fmin(fmax(v, 0), 1) * ph);
                if (px >= 0) line(&c, px, py, x, y, col);
                dot(&c, x, y, 3, col);
                px = x, py = y;
            }
        }
    }
    for (int m = 0; m < nm; m++) {
        const int lx = margin + (m % 4) * 80, ly = margin + ph + 30 + (m / 4) * 18;
        for (int dy = 0; dy < 10; dy++)
            for (int dx = 0; dx < 16; dx++) put(&c, lx + dx, ly + dy, palette[m % 10]);
        number(&c, lx + 22, ly, m + 1, 2);
    }
    /* encoded in memory, then written whole (tool_write_file) */
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = (png_uint_32)c.w;
    img.height = (png_uint_32)c.h;
    img.format = PNG_FORMAT_RGB;
    png_alloc_size_t size = 0;
    bool ok = png_image_write_get_memory_size(img, size, 0, c.rgb, 0, NULL) != 0;
    void *mem = ok ? malloc(size) : NULL;
    ok = mem && png_image_write_to_memory(&img, mem, &size, 0, c.rgb, 0, NULL) != 0;
    png_image_free(&img);
    if (ok) ok = tool_write_file("scbench", path, mem, (size_t)size);
    free(mem);
    free(c.rgb);
    return ok;
#else
    (void)path, (void)acc, (void)n_panels, (void)nm, (void)nt, (void)palette, (void)digits;
    return false;
#endif
}
