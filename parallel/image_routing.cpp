#include "parallel/image_routing.h"

#include <algorithm>
#include <map>

#include "core/check.h"
#include "parallel/image_exchange.h"

namespace dhp {
namespace {

// Every image of the group, by (doc, position); the encoders are not dealt yet.
std::vector<GroupImage> images_of(const Plan& plan, const PlanGroup& grp,
                                  const ImageSpansOf& spans_of) {
  std::vector<GroupImage> out;
  for (size_t doc = 0; doc < grp.seqs.size(); ++doc) {
    const SeqShape& seq = plan.seqs()[size_t(grp.seqs[doc])];
    if (seq.images == 0) continue;
    for (const ImageSpan& span : spans_of(seq.id))
      out.push_back(GroupImage{int32_t(doc), seq.id, span, 0});
  }
  return out;
}

// Fills the encoders (dealt by assign_images) and the images `me` encodes.
void deal_encoders(int d, int me, ImageRouting& r) {
  std::vector<int64_t> sizes;
  for (const GroupImage& im : r.images) sizes.push_back(im.span.tokens);
  const std::vector<int> enc = assign_images(sizes, d);
  for (size_t i = 0; i < r.images.size(); ++i) {
    r.images[i].encoder = enc[i];
    if (enc[i] == me) r.encode.push_back(int(i));
  }
}

// Every ring member's token ranges, to find the member holding each image token.
class Holders {
 public:
  Holders(const Plan& plan, int g) : grp_(plan.groups()[size_t(g)]), held_(size_t(grp_.ring_degree)) {
    for (int r = 0; r < grp_.ring_degree; ++r) {
      held_[size_t(r)] = plan.ranges(g, grp_.first_rank + r);
      DHP_ASSERT(!held_[size_t(r)].empty());  // a ring member without tokens would stall the ring
    }
  }
  const std::vector<TokenRange>& ranges(int member) const { return held_[size_t(member)]; }
  // The ring index of the member holding position `pos` of the group's sequence `doc`.
  int of(int32_t doc, int64_t pos) const {
    const int32_t seq = grp_.seqs[size_t(doc)];
    for (int r = 0; r < grp_.ring_degree; ++r)
      for (const TokenRange& tr : held_[size_t(r)])
        if (tr.seq == seq && pos >= tr.begin && pos < tr.end) return r;
    DHP_ASSERT(false && "a token that no rank of its group holds");
    return -1;
  }

 private:
  const PlanGroup& grp_;
  std::vector<std::vector<TokenRange>> held_;
};

// An image row a member receives: from its encoder, for position `pos` of sequence `doc`.
struct Received {
  int encoder;
  int32_t doc;
  int64_t pos;
};

// The received row of each token of `mine` (a member's ranges, in order), or -1 for a text
// token. Received rows are laid out encoder by encoder, each in (doc, position) order.
std::vector<int32_t> slots(const PlanGroup& grp, const std::vector<TokenRange>& mine,
                           const std::vector<Received>& received, const std::vector<int64_t>& recv) {
  std::vector<int64_t> offset(recv.size(), 0);
  for (size_t r = 1; r < recv.size(); ++r) offset[r] = offset[r - 1] + recv[r - 1];
  std::map<std::pair<int32_t, int64_t>, int32_t> row_of;  // (doc, position) -> received row
  for (const Received& r : received) row_of[{r.doc, r.pos}] = int32_t(offset[size_t(r.encoder)]++);
  std::vector<int32_t> out;
  for (const TokenRange& tr : mine) {
    const auto at = std::find(grp.seqs.begin(), grp.seqs.end(), tr.seq);
    const int32_t doc = int32_t(at - grp.seqs.begin());
    for (int64_t pos = tr.begin; pos < tr.end; ++pos) {
      const auto row = row_of.find({doc, pos});
      out.push_back(row == row_of.end() ? -1 : row->second);
    }
  }
  return out;
}

}  // namespace

int64_t ImageRouting::rows_received() const {
  int64_t n = 0;
  for (int64_t r : recv) n += r;
  return n;
}

std::vector<std::vector<int32_t>> ImageRouting::send_rows(
    const std::vector<int64_t>& first_row) const {
  DHP_ASSERT(first_row.size() == encode.size());
  std::vector<std::vector<int32_t>> out(send.size());
  for (size_t r = 0; r < send.size(); ++r)
    for (auto [e, j] : send[r])
      out[r].push_back(first_row[size_t(e)] < 0 ? -1 : int32_t(first_row[size_t(e)] + j));
  return out;
}

ImageRouting route_images(const Plan& plan, int g, int me, const ImageSpansOf& spans_of) {
  const PlanGroup& grp = plan.groups()[size_t(g)];
  ImageRouting out;
  out.images = images_of(plan, grp, spans_of);
  if (out.images.empty()) return out;
  const int d = grp.ring_degree;
  deal_encoders(d, me, out);
  std::vector<int32_t> mine(out.images.size(), -1);  // index into encode
  for (size_t e = 0; e < out.encode.size(); ++e) mine[size_t(out.encode[e])] = int32_t(e);
  const Holders holders(plan, g);
  // Rows in (doc, position) order — the images are in that order and rows within an image
  // follow positions — which is the order both ends of every pair use.
  out.send.assign(size_t(d), {});
  out.recv.assign(size_t(d), 0);
  std::vector<Received> received;  // rows this member holds, in (doc, position) order
  for (size_t i = 0; i < out.images.size(); ++i) {
    const GroupImage& im = out.images[i];
    for (int64_t j = 0; j < im.span.tokens; ++j) {
      const int h = holders.of(im.doc, im.span.first + j);
      if (im.encoder == me) out.send[size_t(h)].push_back({mine[i], int32_t(j)});
      if (h == me) {
        ++out.recv[size_t(im.encoder)];
        received.push_back({im.encoder, im.doc, im.span.first + j});
      }
    }
  }
  out.slot = slots(grp, holders.ranges(me), received, out.recv);
  return out;
}

}  // namespace dhp
