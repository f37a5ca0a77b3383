/*
 * heatmap_png.c: the heat map of `minference eval --png`: one panel of cells per method, the
 * lengths and depths drawn in a 3x5 pixel font, written as an 8-bit RGB PNG by libpng.
 */
#include "heatmap_png.h"
#include "tool_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MI_TOOLS_LIBPNG
#include <png.h>
#endif

bool heatmap_png_supported(void) {
#ifdef MI_TOOLS_LIBPNG
    return true;
#else
    return false;
#endif
}

static bool png_write(const char *path, const unsigned char *rgb, uint32_t w, uint32_t h) {
#ifdef MI_TOOLS_LIBPNG
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = w;
    img.height = h;
    img.format = PNG_FORMAT_RGB;
    /* encoded in memory, then written whole (tool_write_file), so a failed or interrupted
     * run never leaves a truncated image */
    png_alloc_size_t size = 0;
    bool ok = png_image_write_get_memory_size(img, size, 0, rgb, 0, NULL) != 0;
    void *mem = ok ? malloc(size) : NULL;
    ok = mem && png_image_write_to_memory(&img, mem, &size, 0, rgb, 0, NULL) != 0;
    png_image_free(&img);
    if (ok) ok = tool_write_file("png", path, mem, (size_t)size);
    free(mem);
    return ok;
#else
    (void)path, (void)rgb, (void)w, (void)h;
    return false;
#endif
}

/* 3x5 digits and the few letters the heat map labels use. */
static const char *glyph(char c) {
    switch (c) {
    case '0': return "111101101101111";
    case '1': return "010110010010111";
    case '2': return "111001111100111";
    case '3': return "111001111001111";
    case '4': return "101101111001001";
    case '5': return "111100111001111";
    case '6': return "111100111101111";
    case '7': return "111001001001001";
    case '8': return "111101111101111";
    case '9': return "111101111001111";
    case 'K': return "101101110101101";
    case '%': return "101001010100101";
    case '.': return "000000000000010";
    default: return NULL;
    }
}

static void draw_text(unsigned char *rgb, int W, int H, int x, int y, const char *s, int px) {
    for (; *s; s++, x += 4 * px) {
        const char *g = glyph(*s);
        if (!g) continue;
        for (int gy = 0; gy < 5; gy++)
            for (int gx = 0; gx < 3; gx++) {
                if (g[gy * 3 + gx] != '1') continue;
                for (int dy = 0; dy < px; dy++)
                    for (int dx = 0; dx < px; dx++) {
                        int X = x + gx * px + dx, Y = y + gy * px + dy;
                        if (X < 0 || Y < 0 || X >= W || Y >= H) continue;
                        memset(rgb + ((size_t)Y * W + X) * 3, 0, 3);
                    }
            }
    }
}

static void heat_color(double v, unsigned char *c) {
    if (!(v == v)) {
        c[0] = c[1] = c[2] = 160; /* no data: grey */
        return;
    }
    v = v < 0 ? 0 : v > 1 ? 1 : v;
    /* red (0) -> yellow (0.5) -> green (1) */
    double r = v < 0.5 ? 220 : 220 - (v - 0.5) * 2 * 180;
    double g = v < 0.5 ? 50 + v * 2 * 160 : 210 - (v - 0.5) * 2 * 30;
    c[0] = (unsigned char)r;
    c[1] = (unsigned char)g;
    c[2] = 50;
}

/* grid[m][li][di] in [0, 1]; one panel per method. */
bool heatmap_write_png(const char *path, const double *grid, int nm, int nl, int nd,
                       const long long *lengths, const long long *depths) {
    const int cell = 28, gap = 16, margin = 30, px = 2;
    const int pw = nl * cell, ph = nd * cell;
    const int W = margin + nm * (pw + gap), H = margin + ph + 8;
    unsigned char *rgb = malloc((size_t)W * H * 3);
    if (!rgb) return false;
    memset(rgb, 255, (size_t)W * H * 3);
    for (int m = 0; m < nm; m++) {
        const int x0 = margin + m * (pw + gap);
        for (int li = 0; li < nl; li++) {
            char lab[24];
            if (lengths[li] >= 1024 && lengths[li] % 1024 == 0)
                snprintf(lab, sizeof lab, "%lldK", lengths[li] / 1024);
            else
                snprintf(lab, sizeof lab, "%lld", lengths[li]);
            draw_text(rgb, W, H, x0 + li * cell + 2, margin - 14, lab, px);
            for (int di = 0; di < nd; di++) {
                unsigned char c[3];
                heat_color(grid[((size_t)m * nl + li) * nd + di], c);
                for (int y = 1; y < cell - 1; y++)
                    for (int x = 1; x < cell - 1; x++) {
                        unsigned char *p =
                            rgb + ((size_t)(margin + di * cell + y) * W + x0 + li * cell + x) * 3;
                        memcpy(p, c, 3);
                    }
            }
        }
    }
    for (int di = 0; di < nd && depths; di++) {
        char lab[24];
        snprintf(lab, sizeof lab, "%lld", depths[di]);
        draw_text(rgb, W, H, 2, margin + di * cell + 8, lab, px);
    }
    bool ok = png_write(path, rgb, (uint32_t)W, (uint32_t)H);
    free(rgb);
    return ok;
}
