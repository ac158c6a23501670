//! The XDP program and the agent hash an IPv6 flow alike. The program reads an address a word
//! at a time (`lb_common::words`, `packet::flow_key6`), the agent byte by byte, and each finds
//! flows the other placed: connection-table buckets and fingerprints, the VIP filter's bit, the
//! Maglev flow hash. `lab_hashes6` (BPF_PROG_TEST_RUN) writes the program's hashes of a packet
//! into it; they must equal the agent's, over addresses whose every byte is set to a value of
//! its own, high bits included, so that a word read in the wrong order or width shows.

use std::net::Ipv6Addr;

use aya::{EbpfLoader, programs::Xdp};
use lb_common::{
    flow_table,
    hash::flow_hash,
    service::{Address, ConnectionKeyOf, FlowKeyOf},
    vip_filter,
};
use lb_lab::{
    fixture::{XDP_TX, run_xdp},
    packet::{Noise, ipv6_frame},
};

/// The hashes `lab_hashes6` writes, in its order.
const HASHES: usize = 5;

fn bytes<const N: usize>(noise: &mut Noise) -> [u8; N] {
    std::array::from_fn(|_| noise.byte())
}

fn agents_hashes(
    src: [u8; 16],
    dst: [u8; 16],
    ports: ([u8; 2], [u8; 2]),
    seed: u32,
    service: u16,
) -> [u32; HASHES] {
    let flow = FlowKeyOf::new(src, dst, ports.0, ports.1, 17);
    let key = ConnectionKeyOf::of(&flow, service);
    [
        vip_filter::bit_of(&dst, ports.1, 17),
        flow_table::bucket_hash(&src, ports.0, seed),
        flow_table::fingerprint(&key, seed).get(),
        flow_hash(&flow),
        dst.fold(),
    ]
}

#[test]
fn the_program_hashes_ipv6_flows_as_the_agent_does() {
    let mut noise = Noise::new(0x9e37_79b9_7f4a_7c15);
    for (seed, service) in [(0u32, 0u16), (0x8badf00d, 7), (0xffff_ffff, 0xffff)] {
        let mut ebpf = EbpfLoader::new()
            .override_global("LAB_HASH_SEED", &seed, true)
            .override_global("LAB_HASH_SERVICE", &service, true)
            .load(lb_agent::dataplane::EMBEDDED_OBJECT)
            .expect("loading the BPF object");
        let program: &mut Xdp = ebpf.program_mut("lab_hashes6").unwrap().try_into().unwrap();
        program.load().expect("the verifier accepts lab_hashes6");
        for case in 0..64 {
            let (src, dst) = (bytes::<16>(&mut noise), bytes::<16>(&mut noise));
            let ports = (bytes::<2>(&mut noise), bytes::<2>(&mut noise));
            let mut udp = [ports.0, ports.1, [0, 8 + 4 * HASHES as u8], [0; 2]].concat();
            udp.extend([0u8; 4 * HASHES]);
            let frame =
                ipv6_frame([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], src.into(), dst.into(), 64, 17, &udp);
            let (action, out) = run_xdp(program, &frame, 0);
            assert_eq!(action, XDP_TX, "case {case}");
            let payload = &out[14 + 40 + 8..];
            let program_hashes: [u32; HASHES] =
                std::array::from_fn(|i| u32::from_be_bytes(payload[4 * i..4 * i + 4].try_into().unwrap()));
            assert_eq!(
                program_hashes,
                agents_hashes(src, dst, ports, seed, service),
                "case {case}: {} → {} ports {ports:?}, seed {seed:#x}, service {service} \
                 (filter bit, bucket, fingerprint, flow hash, fold)",
                Ipv6Addr::from(src),
                Ipv6Addr::from(dst),
            );
        }
    }
}
