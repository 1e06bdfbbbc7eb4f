import torch
import torch.nn.functional as F

from lmtrain.output import FullSoftmax


def test_log_prob_matches_direct_log_softmax_and_is_chunk_invariant():
    torch.manual_seed(0)
    out = FullSoftmax(num_classes=37, dim=8, init_range=0.5)
    torch.nn.init.normal_(out.bias)
    hidden, target = torch.randn(11, 8), torch.randint(0, 37, (11,))
    direct = F.log_softmax(hidden @ out.weight.T + out.bias, dim=1).gather(1, target[:, None])[:, 0]
    torch.testing.assert_close(out.log_prob(hidden, target), direct)
    out.eval_chunk = 5  # 8 chunks, the last one partial
    torch.testing.assert_close(out.log_prob(hidden, target), direct)
    torch.testing.assert_close(out.loss(hidden, target), -direct.mean())
