// The backing store of the in-simulator DRAM model (weft_dram.sv), through DPI-C.
//
// The memory is a file mapped MAP_SHARED: Python (weft.sim.dram_model) sizes it to a power of two and writes
// the DRAM image into it with numpy.memmap before a run and reads the outputs after, so no Python runs per
// beat. Addresses wrap at the file's size, as cocotbext-axi's AxiRam does. Broken AXI rules are appended,
// one line each, to a text file that Python reads after the run (the model also answers them SLVERR, which
// the accelerator reports as a bus error).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace {
uint8_t* mem = nullptr;
uint64_t mask = 0;
FILE* violations = nullptr;

void fail(const char* what, const char* path) {
    std::fprintf(stderr, "weft_dram: %s %s\n", what, path);
    std::exit(2);
}

void report(const char* kind, uint32_t addr, int beats, const char* what) {
    if (violations != nullptr) {
        std::fprintf(violations, "%s burst at 0x%08x (%d beats): %s\n", kind, addr, beats, what);
        std::fflush(violations);
    }
}
}  // namespace

extern "C" void weft_dram_open(const char* image, const char* log) {
    int fd = open(image, O_RDWR);
    if (fd < 0) fail("cannot open the DRAM image", image);
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size == 0 || (st.st_size & (st.st_size - 1)) != 0)
        fail("the DRAM image's size is not a power of two:", image);
    void* p = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) fail("cannot map the DRAM image", image);
    close(fd);
    mem = static_cast<uint8_t*>(p);
    mask = static_cast<uint64_t>(st.st_size) - 1;
    violations = std::fopen(log, "a");
    if (violations == nullptr) fail("cannot open the violations log", log);
}

extern "C" unsigned int weft_dram_read32(unsigned int addr) {
    uint32_t word = 0;
    for (int k = 3; k >= 0; --k) word = word << 8 | mem[(addr + k) & mask];
    return word;
}

extern "C" void weft_dram_write32(unsigned int addr, unsigned int data, unsigned int strb) {
    for (int k = 0; k < 4; ++k)
        if (strb >> k & 1) mem[(addr + k) & mask] = static_cast<uint8_t>(data >> (8 * k));
}

// The rules real boards need (cocotb_tb.dram._Checker's): 1 when the burst breaks one (each is logged).
extern "C" int weft_dram_check(int write, unsigned int addr, int beats, int size, int burst, int bus_bytes) {
    const char* kind = write ? "write" : "read";
    char what[96];
    int bad = 0;
    if (burst != 1) {
        std::snprintf(what, sizeof what, "burst type %d is not INCR", burst);
        report(kind, addr, beats, what);
        bad = 1;
    }
    if ((1 << size) != bus_bytes) {
        std::snprintf(what, sizeof what, "size %d bytes is not the bus width of %d bytes", 1 << size, bus_bytes);
        report(kind, addr, beats, what);
        bad = 1;
    }
    if (addr % bus_bytes) {
        report(kind, addr, beats, "address not aligned to the bus width");
        bad = 1;
    }
    if ((addr & 0xFFF) + static_cast<uint64_t>(beats) * bus_bytes > 0x1000) {
        report(kind, addr, beats, "crosses a 4 KiB boundary");
        bad = 1;
    }
    return bad;
}

extern "C" void weft_dram_bad_wlast(unsigned int addr, int beat, int beats, int wlast) {
    if (violations != nullptr) {
        std::fprintf(violations, "write burst at 0x%08x: WLAST %d on beat %d of %d\n", addr, wlast, beat, beats);
        std::fflush(violations);
    }
}
