// The DRAM of the Verilator cosimulation: an AXI4 slave inside the simulated design, so the clock runs
// without Python in the loop. It follows the rules of cocotb_tb.dram.DramModel (cocotbext-axi's AxiRam with
// the timing of weft.sim.dram_timing.DramTiming):
//  - AR and AW are always ready; a read burst's first R beat may go out read_latency cycles (at least 1)
//    after its AR handshake, bursts in order, several in flight;
//  - a write burst's B response goes out write_latency cycles (at least 1) after its last W beat; a W beat
//    waits for its burst's AW (the accelerator never sends one first);
//  - R and W move a beat only in the cycles a pause pattern lets through: the duty's fixed period-20
//    pattern (the same as the AxiRam path's), or seeded pseudo-random pauses (random_stalls: not the AxiRam
//    path's sequence);
//  - every burst is checked against the AXI rules boards need (weft_dram_check, and WLAST on the last beat
//    only); a burst that breaks one is logged and answered SLVERR, which the accelerator reports as a bus
//    error.
// On the fixed patterns a first run takes the same cycles as on the AxiRam path (see read_phase).
// The bytes live in a file the C++ side (weft_dram.cpp) maps; the timing comes in plusargs
// (weft.sim.dram_model.plusargs). `hold` stops R (a stuck bus, for watchdog tests).
module weft_dram #(
    parameter integer DATA_W = 64,
    parameter integer ID_W = 2,
    parameter integer ADDR_W = 32
) (
    input  wire clk,
    input  wire hold,
    output reg  [31:0] read_bursts,
    output reg  [31:0] write_bursts,
    input  wire [ADDR_W-1:0] araddr,
    input  wire [7:0] arlen,
    input  wire [2:0] arsize,
    input  wire [1:0] arburst,
    input  wire [ID_W-1:0] arid,
    input  wire arvalid,
    output wire arready,
    output reg  [ID_W-1:0] rid,
    output reg  [DATA_W-1:0] rdata,
    output reg  [1:0] rresp,
    output reg  rlast,
    output reg  rvalid,
    input  wire rready,
    input  wire [ADDR_W-1:0] awaddr,
    input  wire [7:0] awlen,
    input  wire [2:0] awsize,
    input  wire [1:0] awburst,
    input  wire [ID_W-1:0] awid,
    input  wire awvalid,
    output wire awready,
    input  wire [DATA_W-1:0] wdata,
    input  wire [DATA_W/8-1:0] wstrb,
    input  wire wlast,
    input  wire wvalid,
    output wire wready,
    output reg  [ID_W-1:0] bid,
    output reg  [1:0] bresp,
    output reg  bvalid,
    input  wire bready
);
    import "DPI-C" function void weft_dram_open(input string image, input string log);
    import "DPI-C" function int unsigned weft_dram_read32(input int unsigned addr);
    import "DPI-C" function void weft_dram_write32(input int unsigned addr, input int unsigned data,
                                                   input int unsigned strb);
    import "DPI-C" function int weft_dram_check(input int write, input int unsigned addr, input int beats,
                                                input int size, input int burst, input int bus_bytes);
    import "DPI-C" function void weft_dram_bad_wlast(input int unsigned addr, input int beat, input int beats,
                                                     input int wlast);

    localparam integer BYTES = DATA_W / 8;
    localparam integer WORDS = DATA_W / 32;
    // bursts in flight per queue: more than the accelerator ever has outstanding
    localparam integer DEPTH = 32;
    localparam integer PW = 5;
    localparam [1:0] OKAY = 2'd0, SLVERR = 2'd2;

    string image, log;
    int unsigned read_latency, write_latency, read_pause, write_pause, random_stalls, read_pass, write_pass, seed;
    reg [63:0] cycle;
    reg [4:0] read_phase, write_phase;  // positions in the period-20 pause patterns
    reg [31:0] read_rng, write_rng;

    initial begin
        if (!$value$plusargs("weft_dram=%s", image)) $fatal(1, "weft_dram: no +weft_dram=<image file>");
        if (!$value$plusargs("weft_dram_log=%s", log)) $fatal(1, "weft_dram: no +weft_dram_log=<file>");
        if (!$value$plusargs("weft_dram_read_latency=%d", read_latency)) read_latency = 0;
        if (!$value$plusargs("weft_dram_write_latency=%d", write_latency)) write_latency = 0;
        if (!$value$plusargs("weft_dram_read_pause=%d", read_pause)) read_pause = 0;
        if (!$value$plusargs("weft_dram_write_pause=%d", write_pause)) write_pause = 0;
        if (!$value$plusargs("weft_dram_random=%d", random_stalls)) random_stalls = 0;
        if (!$value$plusargs("weft_dram_read_pass=%d", read_pass)) read_pass = 32'hFFFFFFFF;
        if (!$value$plusargs("weft_dram_write_pass=%d", write_pass)) write_pass = 32'hFFFFFFFF;
        if (!$value$plusargs("weft_dram_seed=%d", seed)) seed = 0;
        weft_dram_open(image, log);
        cycle = 0;
        // The phases at which a first run's cycles equal the AxiRam path's (measured: there the R source and
        // the W sink see their generators' values at different edges, counted from cocotb's clock). The
        // testbench's register accesses between runs do not take the same cycles on both paths, so later
        // runs start at other phases of the pattern and may differ by a few cycles.
        read_phase = 4;
        write_phase = 3;
        read_rng = seed * 32'h9E3779B9 + 32'h1;
        write_rng = seed * 32'h85EBCA6B + 32'h2;
        read_bursts = 0;
        write_bursts = 0;
        rvalid = 0;
        bvalid = 0;
        rlast = 0;
        rid = 0;
        rresp = OKAY;
        rdata = 0;
        bid = 0;
        bresp = OKAY;
    end

    function automatic [31:0] xorshift(input [31:0] x);
        reg [31:0] y;
        begin
            y = x ^ (x << 13);
            y = y ^ (y >> 17);
            xorshift = y ^ (y << 5);
        end
    endfunction

    // A beat may move in this cycle (the pause generators of the AxiRam path, one value per cycle).
    wire read_go = random_stalls != 0 ? {8'd0, read_rng[31:8]} < read_pass : !read_pause[read_phase];
    wire write_go = random_stalls != 0 ? {8'd0, write_rng[31:8]} < write_pass : !write_pause[write_phase];

    always @(posedge clk) begin
        cycle <= cycle + 1;
        read_phase <= read_phase == 5'd19 ? 5'd0 : read_phase + 5'd1;
        write_phase <= write_phase == 5'd19 ? 5'd0 : write_phase + 5'd1;
        read_rng <= xorshift(read_rng);
        write_rng <= xorshift(write_rng);
    end

    // ---- reads ---------------------------------------------------------------------------------------------
    reg [ADDR_W-1:0] rq_addr [DEPTH];
    reg [7:0] rq_len [DEPTH];
    reg [ID_W-1:0] rq_id [DEPTH];
    reg [63:0] rq_due [DEPTH];
    reg rq_bad [DEPTH];
    reg [PW:0] rq_head = 0, rq_tail = 0;
    reg [7:0] r_beat = 0;
    wire rq_empty = rq_head == rq_tail;
    assign arready = (rq_tail - rq_head) != DEPTH;

    always @(posedge clk) begin
        if (arvalid && arready) begin
            rq_addr[rq_tail[PW-1:0]] <= araddr;
            rq_len[rq_tail[PW-1:0]] <= arlen;
            rq_id[rq_tail[PW-1:0]] <= arid;
            rq_due[rq_tail[PW-1:0]] <= cycle + 64'(read_latency == 0 ? 1 : read_latency);
            rq_bad[rq_tail[PW-1:0]] <= weft_dram_check(0, 32'(araddr), int'(arlen) + 1, int'(arsize),
                                                       int'(arburst), BYTES) != 0;
            rq_tail <= rq_tail + 1;
            read_bursts <= read_bursts + 1;
        end
        if (!rvalid || rready) begin
            if (!rq_empty && cycle >= rq_due[rq_head[PW-1:0]] && read_go && !hold) begin
                rvalid <= 1;
                rid <= rq_id[rq_head[PW-1:0]];
                rlast <= r_beat == rq_len[rq_head[PW-1:0]];
                if (rq_bad[rq_head[PW-1:0]]) begin
                    rresp <= SLVERR;
                    rdata <= 0;
                end else begin
                    rresp <= OKAY;
                    for (int k = 0; k < WORDS; k++)
                        rdata[32*k +: 32] <= weft_dram_read32(32'(rq_addr[rq_head[PW-1:0]])
                                                              + 32'(r_beat) * BYTES + 32'(4 * k));
                end
                if (r_beat == rq_len[rq_head[PW-1:0]]) begin
                    r_beat <= 0;
                    rq_head <= rq_head + 1;
                end else begin
                    r_beat <= r_beat + 1;
                end
            end else begin
                rvalid <= 0;
            end
        end
    end

    // ---- writes --------------------------------------------------------------------------------------------
    reg [ADDR_W-1:0] wq_addr [DEPTH];
    reg [7:0] wq_len [DEPTH];
    reg [ID_W-1:0] wq_id [DEPTH];
    reg wq_bad [DEPTH];
    reg [PW:0] wq_head = 0, wq_tail = 0;
    reg [7:0] w_beat = 0;
    reg w_broken = 0;  // a beat of the burst so far had a wrong WLAST
    reg w_open = 0;  // the pause pattern lets a W beat in this cycle (the AxiRam path's W sink ready)
    assign awready = (wq_tail - wq_head) != DEPTH;
    // A W beat needs its burst's address: queued, or arriving in the same cycle.
    wire w_queued = wq_head != wq_tail;
    assign wready = w_open && (w_queued || awvalid);
    wire [ADDR_W-1:0] w_addr = w_queued ? wq_addr[wq_head[PW-1:0]] : awaddr;
    wire [7:0] w_len = w_queued ? wq_len[wq_head[PW-1:0]] : awlen;
    wire [ID_W-1:0] w_id = w_queued ? wq_id[wq_head[PW-1:0]] : awid;

    reg [ID_W-1:0] bq_id [DEPTH];
    reg [1:0] bq_resp [DEPTH];
    reg [63:0] bq_due [DEPTH];
    reg [PW:0] bq_head = 0, bq_tail = 0;

    always @(posedge clk) begin : writes
        reg aw_bad, w_bad, wlast_bad;
        aw_bad = 0;
        w_open <= write_go;
        if (awvalid && awready) begin
            aw_bad = weft_dram_check(1, 32'(awaddr), int'(awlen) + 1, int'(awsize), int'(awburst), BYTES) != 0;
            wq_addr[wq_tail[PW-1:0]] <= awaddr;
            wq_len[wq_tail[PW-1:0]] <= awlen;
            wq_id[wq_tail[PW-1:0]] <= awid;
            wq_bad[wq_tail[PW-1:0]] <= aw_bad;
            wq_tail <= wq_tail + 1;
            write_bursts <= write_bursts + 1;
        end
        if (wvalid && wready) begin
            w_bad = w_queued ? wq_bad[wq_head[PW-1:0]] : aw_bad;
            wlast_bad = wlast != (w_beat == w_len);
            if (wlast_bad)
                weft_dram_bad_wlast(32'(w_addr), int'(w_beat), int'(w_len) + 1, int'(wlast));
            if (!w_bad)
                for (int k = 0; k < WORDS; k++)
                    weft_dram_write32(32'(w_addr) + 32'(w_beat) * BYTES + 32'(4 * k), wdata[32*k +: 32],
                                      32'(wstrb[4*k +: 4]));
            if (w_beat == w_len) begin
                w_beat <= 0;
                w_broken <= 0;
                bq_id[bq_tail[PW-1:0]] <= w_id;
                bq_resp[bq_tail[PW-1:0]] <= w_bad || w_broken || wlast_bad ? SLVERR : OKAY;
                bq_due[bq_tail[PW-1:0]] <= cycle + 64'(write_latency == 0 ? 1 : write_latency);
                bq_tail <= bq_tail + 1;
                wq_head <= wq_head + 1;
            end else begin
                w_beat <= w_beat + 1;
                w_broken <= w_broken || wlast_bad;
            end
        end
        if (!bvalid || bready) begin
            if (bq_head != bq_tail && cycle >= bq_due[bq_head[PW-1:0]]) begin
                bvalid <= 1;
                bid <= bq_id[bq_head[PW-1:0]];
                bresp <= bq_resp[bq_head[PW-1:0]];
                bq_head <= bq_head + 1;
            end else begin
                bvalid <= 0;
            end
        end
    end
endmodule
