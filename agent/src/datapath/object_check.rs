//! Checks of the built object that no test run on x86-64 can make: the barriers of the
//! programs' reads of `IPQ_SLOTS` (`ipq_common::slots`, "Memory order") are what a weakly
//! ordered CPU needs. x86-64 keeps loads in order, so no run here can show a missing or wrong
//! barrier; the instructions can.

use aya_obj::{generated::bpf_insn, Object};
use ipq_common::{
    names,
    slots::{SlotsOrder, SLOT_WAYS},
};

use super::object::{OBJECT, OBJECT_FETCH_BARRIERS};

/// `BPF_STX | BPF_ATOMIC` with a 64-bit operand, and the `imm` bits of an atomic instruction.
const STX_ATOMIC_DW: u8 = 0x03 | 0xc0 | 0x18;
const ATOMIC_CLASS_MODE_MASK: u8 = 0x07 | 0xe0;
const STX_ATOMIC: u8 = 0x03 | 0xc0;
const BPF_FETCH: i32 = 0x01;
const BPF_ADD: i32 = 0x00;
/// `if dst != imm goto` and `if dst == imm goto` (`BPF_JMP | BPF_JNE/JEQ | BPF_K`, 64 and
/// 32 bit).
const JNE_IMM: [u8; 2] = [0x55, 0x56];
const JEQ_IMM: [u8; 2] = [0x15, 0x16];

/// Instructions before a barrier in which its guard (the comparison of the order with
/// [`SlotsOrder::FetchBarrier`]) must stand.
const GUARD_WINDOW: usize = 8;

/// The programs that read the table.
const READERS: [&str; 3] = [
    names::PROG_TC_INGRESS,
    names::PROG_TC_EGRESS,
    names::PROG_XDP_UPLINK,
];

fn object(bytes: &[u8]) -> Object {
    Object::parse(bytes).expect("the embedded object parses")
}

/// The code of `program`: its own function and the functions of `.text` made for it (LLVM
/// moves a large program's body there and calls it; their names carry the program's).
fn instructions(object: &Object, program: &str) -> Vec<bpf_insn> {
    let prog = object
        .programs
        .get(program)
        .unwrap_or_else(|| panic!("no program {program} in the object"));
    let mut code = object
        .functions
        .get(&(prog.section_index, prog.address))
        .unwrap_or_else(|| panic!("no code for {program}"))
        .instructions
        .clone();
    for function in object.functions.values() {
        if function.section_index.0 != prog.section_index && function.name.contains(program) {
            code.extend(function.instructions.iter().copied());
        }
    }
    code
}

fn is_atomic(insn: &bpf_insn) -> bool {
    insn.code & ATOMIC_CLASS_MODE_MASK == STX_ATOMIC
}

/// A barrier as the programs write it: a 64-bit fetch-add.
fn is_fetch_add(insn: &bpf_insn) -> bool {
    insn.code == STX_ATOMIC_DW && insn.imm == (BPF_ADD | BPF_FETCH)
}

/// Whether the instructions just before `at` compare something with the fetch-barrier order:
/// the barrier runs only where the loader chose that order.
fn guarded(code: &[bpf_insn], at: usize) -> bool {
    let from = at.saturating_sub(GUARD_WINDOW);
    code[from..at].iter().any(|insn| {
        (JNE_IMM.contains(&insn.code) || JEQ_IMM.contains(&insn.code))
            && insn.imm == SlotsOrder::FetchBarrier as i32
    })
}

/// Whether the register the atomic writes through was made from the frame pointer (`r10`)
/// within the instructions before it: the barrier's word is on the program's stack, never
/// a map value another CPU writes (an atomic on a shared line would cost every packet).
fn on_stack(code: &[bpf_insn], at: usize) -> bool {
    let reg = code[at].dst_reg();
    if reg == 10 {
        return true;
    }
    code[at.saturating_sub(GUARD_WINDOW)..at]
        .iter()
        .any(|insn| {
            // `reg = r10` (BPF_ALU64 | BPF_MOV | BPF_X).
            insn.code == 0xbf && insn.dst_reg() == reg && insn.src_reg() == 10
        })
}

#[test]
fn every_atomic_of_the_ordered_object_fetches() {
    let object = object(OBJECT_FETCH_BARRIERS);
    let mut atomics = 0;
    for function in object.functions.values() {
        for insn in function.instructions.iter().filter(|i| is_atomic(i)) {
            atomics += 1;
            assert!(
                insn.imm & BPF_FETCH != 0,
                "{}: an atomic without BPF_FETCH (code {:#x}, imm {:#x}): it orders nothing on \
                 arm64",
                function.name,
                insn.code,
                insn.imm
            );
        }
    }
    assert!(
        atomics > 0,
        "the ordered object has no atomic at all: the barriers are gone"
    );
}

/// The object x86-64 (and a weakly ordered CPU before 5.12) loads has no atomic instruction:
/// 5.10's verifier refuses an atomic with `BPF_FETCH` even where the order's constant makes it
/// dead code, before it looks at any path.
#[test]
fn the_plain_object_has_no_atomic() {
    let object = object(OBJECT);
    for function in object.functions.values() {
        assert!(
            !function.instructions.iter().any(is_atomic),
            "{}: an atomic instruction in the object every kernel must load",
            function.name
        );
    }
}

#[test]
fn each_reader_of_the_table_has_guarded_stack_barriers_around_its_reads() {
    let object = object(OBJECT_FETCH_BARRIERS);
    // One probe: a pair around the bucket's version, and a pair around every slot of both
    // buckets it may read (LLVM unrolls the ways).
    let per_probe = 2 + 2 * 2 * SLOT_WAYS as usize;
    for program in READERS {
        let code = instructions(&object, program);
        let barriers: Vec<usize> = (0..code.len())
            .filter(|&i| is_fetch_add(&code[i]))
            .collect();
        assert!(
            !barriers.is_empty() && barriers.len().is_multiple_of(per_probe),
            "{program}: {} barriers, not a whole number of probes of {per_probe}: a read of \
             the table lost its barrier, or the probe changed and this check with it",
            barriers.len()
        );
        for &at in &barriers {
            assert!(
                guarded(&code, at),
                "{program}: the barrier at instruction {at} is not guarded by the order"
            );
            assert!(
                on_stack(&code, at),
                "{program}: the barrier at instruction {at} is not on the stack"
            );
        }
    }
}

/// Fewest instructions a packet program's own function may hold: the parse, the filter and
/// the table's lookup (1500-4300 today). A program whose body LLVM moved out of line is a
/// handful (a call and the return code), and every packet then pays a BPF-to-BPF call:
/// 58a5292 did that to the XDP program (33 -> 42 ns a pass, found by a bisected benchmark).
const ENTRY_MIN_INSNS: usize = 500;

#[test]
fn each_packet_programs_body_is_in_its_entry_point() {
    for bytes in [OBJECT, OBJECT_FETCH_BARRIERS] {
        let object = object(bytes);
        for program in READERS {
            let prog = object
                .programs
                .get(program)
                .unwrap_or_else(|| panic!("no program {program} in the object"));
            let own = object
                .functions
                .get(&(prog.section_index, prog.address))
                .unwrap_or_else(|| panic!("no code for {program}"))
                .instructions
                .len();
            assert!(
                own >= ENTRY_MIN_INSNS,
                "{program}: {own} instructions in its entry point: its body went out of line \
                 (a BPF-to-BPF call on every packet); `#[inline(always)]` on the function the \
                 entry point calls"
            );
        }
    }
}

/// Both objects create `IPQ_ADDRS` unpreallocated: where the programs read only that map (a
/// weakly ordered CPU before 5.12), its kernel then frees a replaced element after a grace
/// period instead of copying the next update into it under a program still reading it.
#[test]
fn both_objects_create_the_address_map_unpreallocated() {
    for (which, bytes) in [("plain", OBJECT), ("ordered", OBJECT_FETCH_BARRIERS)] {
        let object = object(bytes);
        let map = object
            .maps
            .get(names::MAP_ADDRS)
            .unwrap_or_else(|| panic!("no {} in the {which} object", names::MAP_ADDRS));
        assert_ne!(
            map.map_flags() & ipq_common::addr::BPF_F_NO_PREALLOC,
            0,
            "the {which} object's {} is preallocated (flags {:#x})",
            names::MAP_ADDRS,
            map.map_flags()
        );
    }
}
