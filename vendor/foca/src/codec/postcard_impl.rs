/* This Source Code Form is subject to the terms of the Mozilla Public
 * License, v. 2.0. If a copy of the MPL was not distributed with this
 * file, You can obtain one at https://mozilla.org/MPL/2.0/. */
use bytes::{Buf, BufMut};
use postcard::ser_flavors::Flavor as SerFlavor;

use crate::{Codec, Header, Member};

/// `PostcardCodec` encodes/decodes packets using [`postcard`].
#[derive(Debug, Clone, Copy)]
pub struct PostcardCodec;

// XXX We can use Buf::chunk here because Foca guarantees the buffer is
//     contiguous... Maybe a marker trait like `trait ContiguousBuf: Buf {}`
//     or some other form of making it explicit in the type would be
//     helpful?
impl<T> Codec<T> for PostcardCodec
where
    T: serde::Serialize + for<'de> serde::Deserialize<'de>,
{
    type Error = postcard::Error;

    fn encode_header(&mut self, payload: &Header<T>, buf: impl BufMut) -> Result<(), Self::Error> {
        encode(payload, buf)
    }

    fn decode_header(&mut self, mut buf: impl Buf) -> Result<Header<T>, Self::Error> {
        let remaining = buf.remaining();
        debug_assert_eq!(remaining, buf.chunk().len());
        let (payload, rest) = postcard::take_from_bytes(buf.chunk())?;
        let after = rest.len();
        buf.advance(remaining - after);
        Ok(payload)
    }

    fn encode_member(&mut self, member: &Member<T>, buf: impl BufMut) -> Result<(), Self::Error> {
        encode(member, buf)
    }

    /// Counted as postcard writes it, with nothing written: an identity's
    /// strings add their lengths, not copies.
    fn header_len(&mut self, header: &Header<T>) -> Result<usize, Self::Error> {
        postcard::serialize_with_flavor(header, postcard::ser_flavors::Size::default())
    }

    /// Counted as [`header_len`](Self::header_len) counts a header.
    fn member_len(&mut self, member: &Member<T>) -> Result<usize, Self::Error> {
        postcard::serialize_with_flavor(member, postcard::ser_flavors::Size::default())
    }

    fn decode_member(&mut self, mut buf: impl Buf) -> Result<Member<T>, Self::Error> {
        let remaining = buf.remaining();
        debug_assert_eq!(remaining, buf.chunk().len());
        let (member, rest) = postcard::take_from_bytes(buf.chunk())?;
        let after = rest.remaining();
        buf.advance(remaining - after);
        Ok(member)
    }
}

/// Bytes of the stack buffer a header or member is first encoded into:
/// room for a header naming two nodes by peer id and two addresses each.
const STACK_BYTES: usize = 512;

/// Encodes `value` into a buffer on the stack, then copies it to `buf` in
/// one piece: postcard writes a slice with a bounds check per field,
/// where a `BufMut` such as `Limit<&mut BytesMut>` costs a call, a limit
/// and a capacity check per field (a header cost some 900 instructions).
/// A value larger than the stack buffer is written to `buf` directly.
/// Either way `buf` gets the same bytes; a value that does not fit in
/// `buf` is an error, with nothing written (callers truncate what a
/// failed encoding wrote anyway).
fn encode<S: serde::Serialize>(value: &S, mut buf: impl BufMut) -> postcard::Result<()> {
    let mut stack = [0u8; STACK_BYTES];
    match postcard::to_slice(value, &mut stack) {
        Ok(bytes) if buf.remaining_mut() >= bytes.len() => {
            buf.put_slice(bytes);
            Ok(())
        }
        Ok(_) => Err(postcard::Error::SerializeBufferFull),
        Err(postcard::Error::SerializeBufferFull) => {
            postcard::serialize_with_flavor(value, WrappedBuf(buf))
        }
        Err(e) => Err(e),
    }
}

struct WrappedBuf<B>(B);

impl<B: BufMut> SerFlavor for WrappedBuf<B> {
    type Output = ();

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        if self.0.has_remaining_mut() {
            self.0.put_u8(data);
            Ok(())
        } else {
            Err(postcard::Error::SerializeBufferFull)
        }
    }

    fn finalize(self) -> postcard::Result<Self::Output> {
        Ok(())
    }

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<Self::Output> {
        if self.0.remaining_mut() >= data.len() {
            self.0.put_slice(data);
            Ok(())
        } else {
            Err(postcard::Error::SerializeBufferFull)
        }
    }
}

#[cfg(test)]
mod test {
    use super::PostcardCodec;

    #[test]
    fn postcard_roundtrip() -> Result<(), postcard::Error> {
        crate::testing::verify_codec_roundtrip(PostcardCodec)
    }

    #[test]
    fn a_headers_length_is_what_encoding_it_writes() {
        use crate::{Codec, Header, Message};
        use alloc::{string::String, vec::Vec};

        for len in [0, 1, 127, 128, super::STACK_BYTES, 20_000] {
            for message in [
                Message::Ping(0),
                Message::Ack(200),
                Message::PingReq {
                    target: "t".repeat(len),
                    probe_number: 9,
                },
                Message::Announce,
            ] {
                let header = Header {
                    src: "s".repeat(len),
                    src_incarnation: 300,
                    dst: String::from("d"),
                    message,
                };
                let mut out = Vec::new();
                Codec::<String>::encode_header(&mut PostcardCodec, &header, &mut out)
                    .expect("room enough");
                let counted = Codec::<String>::header_len(&mut PostcardCodec, &header);
                assert_eq!(counted, Ok(out.len()), "{header:?}");
            }
        }
    }

    #[test]
    fn encoded_bytes_are_postcards_below_and_above_the_stack_buffer() {
        use crate::{Codec, Member, State};
        use alloc::{string::String, vec, vec::Vec};
        use bytes::BufMut;

        for len in [0, 10, super::STACK_BYTES - 4, super::STACK_BYTES, 600, 2000] {
            let member = Member::new("x".repeat(len), 7, State::Suspect);
            let mut want = [0u8; 4096];
            let want = postcard::to_slice(&member, &mut want)
                .expect("fits")
                .to_vec();

            // After what the buffer held already, as a packet's members are.
            let mut out = vec![1, 2, 3];
            Codec::<String>::encode_member(&mut PostcardCodec, &member, &mut out)
                .expect("room enough");
            assert_eq!(out[..3], [1, 2, 3]);
            assert_eq!(out[3..], want[..], "{len} bytes of identity");
            let counted = Codec::<String>::member_len(&mut PostcardCodec, &member);
            assert_eq!(counted, Ok(want.len()), "{len} bytes of identity");

            // One byte short of room: an error, and what was there kept.
            let mut short = Vec::new();
            let res = Codec::<String>::encode_member(
                &mut PostcardCodec,
                &member,
                (&mut short).limit(want.len() - 1),
            );
            assert!(res.is_err(), "{len} bytes of identity");
            assert!(want.starts_with(&short), "only a prefix of it, if anything");
        }
    }
}
