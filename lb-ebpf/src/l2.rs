//! Link layer: what the program answers for the segment.

pub mod arp;
