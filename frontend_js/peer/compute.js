// The compute modules the page's jobs are handed (the run host, the model store, group restore,
// the stored run): the JS mirror of daisy/. Imported with the page, not on demand: the run
// controller imports the same modules (../run/), so nothing could load the page without them.
//
//   COMPUTE = { train, config, model, hashing, optim }
import * as train from '../train.js';
import * as config from '../config.js';
import * as model from '../model.js';
import * as hashing from '../hashing.js';
import * as optim from '../optim.js';

export const COMPUTE = Object.freeze({ train, config, model, hashing, optim });
